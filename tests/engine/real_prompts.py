"""The user questions the real-model tests ask the default model (chat-templated by each test)."""

QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "请用中文介绍一下北京。",
    "List three prime numbers and explain why they are prime.",
    "def fibonacci(n):",
]
