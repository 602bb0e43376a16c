"""A CA and a serving certificate for the webhook, as the apiserver verifies them."""
