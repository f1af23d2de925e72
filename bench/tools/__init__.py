"""Tools for a refactor or a review: metric comparison, minibatch trace, longest functions, GPU check."""
