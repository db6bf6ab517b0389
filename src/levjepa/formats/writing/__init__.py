"""Writing weights: the hub-layout export, its model card, a fine-tuned classifier's ``best/``
(``levjepa.formats`` says what each module holds)."""
