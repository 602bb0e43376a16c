"""The decision, pure: image references, workload pod specs, where a pod can land, the images per
node, the verdict. No I/O, clock or threads: every face imports it unchanged."""
