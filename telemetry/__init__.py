"""What operators watch from outside: the Langfuse export, shared by the gateway and the trainer."""
