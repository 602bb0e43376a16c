"""`image-preflight doctor`: what state the cluster is in, one line per finding with its fix.

findings.py judges plain objects (pure), gc.py what the kubelet's image GC may take (pure);
cluster.py reads them from the apiserver, the kubelets' node proxy and the webhook; command.py is
the CLI.
"""
