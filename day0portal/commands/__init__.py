"""`day0` subcommands that belong to the portal."""
