"""Everything that speaks Redis: the key schema, connections, the server version check, RQ's
side of the contract, the one Lua loader and a module per script family, the token plane."""
