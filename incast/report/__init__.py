"""What is made from results: plots, timeout explanations, the papers' figures."""
