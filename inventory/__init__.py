"""`image-preflight inventory`: snapshots of the cluster's node inventory (dump) and the cleanup of
the node agents' lists (delete)."""
