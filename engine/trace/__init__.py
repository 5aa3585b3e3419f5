"""Request traces: the shapes and times of one request's way through the model (`"trace": true`)."""
