"""The verdict: image references, the pod spec of a workload, where a pod may land (scheduling,
RuntimeClasses), the images per node (inventory), the decision and what of it is remembered."""
