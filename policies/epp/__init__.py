"""llm-d EndpointPickerConfig support: its plugin types and its document, as ours."""
