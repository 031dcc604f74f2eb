"""The message plane: publishes, deliveries and settlements moving between
servers as batched records on the links, and the flow control that paces them."""
