"""Scale-out on Ray Serve: an ingress deployment (the FastAPI app), N engine replicas, one control
plane actor. Imports Ray lazily: ``loraplex serve --replicas 1`` never needs it."""
