"""Keeping the images a dataset needs through the kubelet's image GC: what a node's agent pins."""
