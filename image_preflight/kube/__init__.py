"""The Kubernetes-client shell: configuration, list and watch, error text."""
