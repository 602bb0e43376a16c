"""The image-readiness core (pure, no I/O) and the admission webhook built on it."""
