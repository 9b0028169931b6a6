"""One router per resource; handlers stay short and call the service."""
