"""Kernel families: each subpackage exports ``FAMILY`` (see :mod:`tik_evo.family`)."""
