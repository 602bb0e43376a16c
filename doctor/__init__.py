"""`image-preflight doctor`: what state the cluster is in, one line per finding with its fix.

cluster.py reads the apiserver, the kubelets' node proxy and the webhook; the judgements of what it
reads are pure, in image_preflight.core.doctor (findings.py, gc.py); command.py is the CLI.
"""
