"""Reading weights: levjepa runs, checkpoints and exports, the official checkpoints, where they come from, the
views a reader cuts, a classifier's record (``levjepa.formats`` says what each module holds)."""
