"""`image-preflight doctor`: what state the cluster is in, one line per finding with its fix.

findings.py judges plain objects (pure); cluster.py reads them from the apiserver and the webhook;
command.py is the CLI.
"""
