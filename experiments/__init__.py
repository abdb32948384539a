"""funsim.experiments: data loading, thin drivers, plotting and the CLI."""
