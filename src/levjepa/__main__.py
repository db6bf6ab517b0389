"""``python -m levjepa ...`` (also what ``torchrun -m levjepa pretrain ...`` runs)."""

from levjepa.commands import main

raise SystemExit(main())
