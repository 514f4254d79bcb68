"""A NumPy Flower app for edgewatt's tests."""
