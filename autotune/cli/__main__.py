"""``python -m autotune.cli``: the same as the ``autotune`` command."""

from autotune.cli import entry

if __name__ == "__main__":
    entry()
