"""The admission webhook (`image-preflight serve`): HTTPS, TLS reloading, the live inventory, metrics."""
