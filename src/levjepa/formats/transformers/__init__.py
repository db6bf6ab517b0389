"""levjepa met through transformers and huggingface_hub: the hub models, ``AutoConfig`` / ``AutoModel`` /
``AutoVideoProcessor`` registration, their input/output conventions (``levjepa.formats`` says what each module
holds)."""
