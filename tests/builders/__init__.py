"""Objects the tests build, pure, one module by what they build: `nodes` (nodes and their images as
the kubelet, crictl and docker print them; the agents' lists), `inventories` (inventories and pod
specs for the decision), `reviews` (workloads and AdmissionReviews), `deep_reviews` (reviews
nested deep), `stalls` (the Pods, Events and Jobs the watchdog reads), `rows` (dataset rows and
their Job templates), `chart_objects` (the chart's objects as its tests read them)."""
