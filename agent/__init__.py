"""The node agent: the runtime's complete image list over CRI."""
