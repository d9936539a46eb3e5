"""The floor: errors, text formatting, atomic files, model structure, data pipelines."""
