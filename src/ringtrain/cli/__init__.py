"""The ``ringtrain`` command line: argparse in, frozen configs out, nothing else."""
