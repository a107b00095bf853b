"""The operation record: format, reader and writer, importers."""
