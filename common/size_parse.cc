// Placeholder: size parsing lands here.
