"""Studies behind the `perx` subcommands; each writes CSV, PNG and meta.json under results/."""
