"""Wire formats shared by the bridge, the router and the runtime."""
