"""Allow ``python -m artifactd``."""

from artifactd.cli import main

if __name__ == "__main__":
    main()
