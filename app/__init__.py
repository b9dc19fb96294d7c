"""The Gradio app: reads traces from the engine and draws them."""
