Pipeline = object  # a base class for DLE to subclass; never instantiated with synthetic data
