"""The decision, pure: no I/O, clock or threads, so every face imports it unchanged.

decide/ the verdict; sources/ node image lists from their texts; rows/ dataset rows and their
rollout Jobs; admission/ the webhook's answers; watchdog/ stalled pods and failing their Jobs;
image_gc/ pinning; doctor/ the doctor's findings; objects reads API objects without trusting their
shape."""
