"""The decision, pure: no I/O, clock or threads, so every face imports it unchanged.

decide/ the verdict; sources/ node image lists from their texts; admission/ the webhook's
answers; watchdog/ stalled pods and failing their Jobs; image_gc/ pinning; objects reads API
objects without trusting their shape."""
