"""`image-preflight watchdog`: fail a Job whose Pod cannot get its node-local image."""
