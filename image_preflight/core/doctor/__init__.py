"""The doctor's judgements: findings.py judges plain API objects, gc.py what the kubelet's image GC
may take; the doctor face reads what they judge."""
