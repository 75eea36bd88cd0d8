"""Client library, msgpack wire protocol and TCP server."""
