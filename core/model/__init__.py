"""The model layer: what a GGUF says (metadata, architecture, memory plan, vocabulary), below the reader."""
