"""`day0` subcommands that belong to the runtime (no Django)."""
