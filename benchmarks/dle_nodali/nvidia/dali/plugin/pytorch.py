DALIClassificationIterator = None  # see nvidia/dali/__init__.py
