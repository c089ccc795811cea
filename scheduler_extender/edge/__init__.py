"""The extender's HTTP edge: the server, the verbs (decode, decide, encode) and the Prometheus metrics."""
