"""The Job Engine: durable background jobs of server operations (expr, records, manager)."""
