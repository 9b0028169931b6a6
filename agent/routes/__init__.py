"""One router per resource; handlers stay short and call the use case they serve."""
