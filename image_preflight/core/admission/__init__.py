"""The webhook's answers, pure: an AdmissionReview judged (review), a Pod steered (steering,
mutation), and the words the apiserver relays (messages)."""
