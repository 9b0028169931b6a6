"""The agent's HTTP front: serving, the guard middleware, authentication and
authorization, and the FastAPI dependencies the routes take."""
