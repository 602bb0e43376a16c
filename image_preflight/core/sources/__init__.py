"""Where a node's image list comes from, read without I/O: a snapshot file's text, the kubelet's
capped `node.status.images`, the node agent's complete runtime list."""
