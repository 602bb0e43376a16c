"""The `image-preflight` command line."""
