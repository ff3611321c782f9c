"""One module per subcommand; each exposes cmd_<name>(args) -> exit status."""
