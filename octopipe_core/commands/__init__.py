"""Sub-commands of the ``octopipe`` command line; each module has ``register(subparsers)``."""
