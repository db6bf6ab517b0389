"""``python -m levjepa ...`` (also what ``torchrun -m levjepa pretrain ...`` runs)."""

from levjepa.cli import main

raise SystemExit(main())
