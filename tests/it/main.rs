
mod agent_layers;
